//! The SM clock and board power while a row's timed calls run, read through
//! NVML (the driver's `libnvidia-ml.so.1`, opened at run time so that the
//! benchmark builds and runs without it) by a sampling thread.
//!
//! Without NVML the benchmark still runs: [`Monitor::status`] says why once,
//! and every row's clock and power read `n/a`.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Seconds since the first call in this process: the one clock of the
/// samples and of the timed windows.
pub fn now() -> f64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_secs_f64()
}

type NvmlReturn = c_int;
type NvmlDevice = *mut c_void;
const NVML_SUCCESS: NvmlReturn = 0;
/// `nvmlClockType_t`: NVML_CLOCK_GRAPHICS 0, NVML_CLOCK_SM 1, NVML_CLOCK_MEM 2.
const NVML_CLOCK_SM: c_uint = 1;

/// The NVML functions the monitor calls, on one device.
pub struct Nvml {
    device: NvmlDevice,
    clock_info: unsafe extern "C" fn(NvmlDevice, c_uint, *mut c_uint) -> NvmlReturn,
    power_usage: unsafe extern "C" fn(NvmlDevice, *mut c_uint) -> NvmlReturn,
    /// The device's name, as NVML gives it.
    pub name: String,
    /// The driver's version, as NVML gives it.
    pub driver: String,
}

// NVML's functions are thread-safe, and the device handle is a plain
// pointer into the library's own state (the library stays loaded for the
// life of the process).
unsafe impl Send for Nvml {}
unsafe impl Sync for Nvml {}

/// The text of `dlerror()`, or a placeholder.
fn dl_error() -> String {
    let error = unsafe { libc::dlerror() };
    if error.is_null() {
        "unknown error".into()
    } else {
        unsafe { CStr::from_ptr(error) }.to_string_lossy().into_owned()
    }
}

/// A C string of at most `buffer.len()` bytes, up to its NUL.
fn c_buffer_string(buffer: &[u8]) -> String {
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    String::from_utf8_lossy(&buffer[..end]).into_owned()
}

impl Nvml {
    /// Loads `libnvidia-ml.so.1`, initializes NVML and finds the device
    /// with PCI bus id `pci_bus_id` (`"00000000:3B:00.0"`, the CUDA
    /// device's), or, without one or where NVML does not know it, the only
    /// device NVML sees. Errors say which step failed.
    pub fn open(pci_bus_id: Option<&str>) -> Result<Nvml, String> {
        Self::open_library("libnvidia-ml.so.1", pci_bus_id)
    }

    fn open_library(library: &str, pci_bus_id: Option<&str>) -> Result<Nvml, String> {
        let name = CString::new(library).map_err(|e| e.to_string())?;
        let lib = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            return Err(format!("cannot load {library}: {}", dl_error()));
        }
        let symbol = |name: &str| -> Result<*mut c_void, String> {
            let c_name = CString::new(name).map_err(|e| e.to_string())?;
            let address = unsafe { libc::dlsym(lib, c_name.as_ptr()) };
            if address.is_null() {
                Err(format!("{library} has no {name}: {}", dl_error()))
            } else {
                Ok(address)
            }
        };
        // SAFETY (all transmutes): the signatures are NVML's (nvml.h).
        let init: unsafe extern "C" fn() -> NvmlReturn = unsafe { std::mem::transmute(symbol("nvmlInit_v2")?) };
        let error_string: unsafe extern "C" fn(NvmlReturn) -> *const c_char =
            unsafe { std::mem::transmute(symbol("nvmlErrorString")?) };
        let describe = |call: &str, status: NvmlReturn| {
            let text = unsafe { error_string(status) };
            let text =
                if text.is_null() { String::new() } else { unsafe { CStr::from_ptr(text) }.to_string_lossy().into() };
            format!("{call} failed with NVML status {status} ({text})")
        };
        let check = |call: &str, status: NvmlReturn| {
            if status == NVML_SUCCESS {
                Ok(())
            } else {
                Err(describe(call, status))
            }
        };
        check("nvmlInit_v2", unsafe { init() })?;
        let by_bus_id: unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> NvmlReturn =
            unsafe { std::mem::transmute(symbol("nvmlDeviceGetHandleByPciBusId_v2")?) };
        let by_index: unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> NvmlReturn =
            unsafe { std::mem::transmute(symbol("nvmlDeviceGetHandleByIndex_v2")?) };
        let count: unsafe extern "C" fn(*mut c_uint) -> NvmlReturn =
            unsafe { std::mem::transmute(symbol("nvmlDeviceGetCount_v2")?) };
        let mut device: NvmlDevice = std::ptr::null_mut();
        let by_bus = match pci_bus_id {
            Some(id) => {
                let id = CString::new(id).map_err(|e| e.to_string())?;
                check("nvmlDeviceGetHandleByPciBusId_v2", unsafe { by_bus_id(id.as_ptr(), &mut device) })
            }
            None => Err("no PCI bus id given".into()),
        };
        if let Err(bus_error) = by_bus {
            let mut devices: c_uint = 0;
            check("nvmlDeviceGetCount_v2", unsafe { count(&mut devices) })?;
            if devices != 1 {
                return Err(format!("{bus_error}, and NVML sees {devices} devices: cannot tell which is ours"));
            }
            check("nvmlDeviceGetHandleByIndex_v2", unsafe { by_index(0, &mut device) })?;
        }
        let get_name: unsafe extern "C" fn(NvmlDevice, *mut c_char, c_uint) -> NvmlReturn =
            unsafe { std::mem::transmute(symbol("nvmlDeviceGetName")?) };
        let get_driver: unsafe extern "C" fn(*mut c_char, c_uint) -> NvmlReturn =
            unsafe { std::mem::transmute(symbol("nvmlSystemGetDriverVersion")?) };
        let mut buffer = [0u8; 128];
        let name = match unsafe { get_name(device, buffer.as_mut_ptr().cast(), buffer.len() as c_uint) } {
            NVML_SUCCESS => c_buffer_string(&buffer),
            status => describe("nvmlDeviceGetName", status),
        };
        let mut buffer = [0u8; 128];
        let driver = match unsafe { get_driver(buffer.as_mut_ptr().cast(), buffer.len() as c_uint) } {
            NVML_SUCCESS => c_buffer_string(&buffer),
            status => describe("nvmlSystemGetDriverVersion", status),
        };
        let clock_info: unsafe extern "C" fn(NvmlDevice, c_uint, *mut c_uint) -> NvmlReturn =
            unsafe { std::mem::transmute(symbol("nvmlDeviceGetClockInfo")?) };
        let power_usage: unsafe extern "C" fn(NvmlDevice, *mut c_uint) -> NvmlReturn =
            unsafe { std::mem::transmute(symbol("nvmlDeviceGetPowerUsage")?) };
        let nvml = Nvml { device, clock_info, power_usage, name, driver };
        // One reading now, so that a device that gives neither fails here,
        // once, rather than as n/a in every row.
        let (mhz, watts) = nvml.read();
        if mhz.is_none() && watts.is_none() {
            let mut value: c_uint = 0;
            let status = unsafe { (nvml.clock_info)(nvml.device, NVML_CLOCK_SM, &mut value) };
            return Err(describe("nvmlDeviceGetClockInfo(NVML_CLOCK_SM)", status));
        }
        Ok(nvml)
    }

    /// The SM clock (MHz) and the board power (W) now, each where NVML gives
    /// it. (On Hopper, `nvmlDeviceGetPowerUsage` is the driver's average over
    /// about the last second.)
    pub fn read(&self) -> (Option<f64>, Option<f64>) {
        let (mut mhz, mut milliwatts): (c_uint, c_uint) = (0, 0);
        let clock = unsafe { (self.clock_info)(self.device, NVML_CLOCK_SM, &mut mhz) } == NVML_SUCCESS;
        let power = unsafe { (self.power_usage)(self.device, &mut milliwatts) } == NVML_SUCCESS;
        (clock.then_some(mhz as f64), power.then_some(milliwatts as f64 / 1e3))
    }
}

/// One reading: when ([`now`]), SM MHz and W.
#[derive(Clone, Copy, Debug)]
struct Sample {
    t: f64,
    mhz: Option<f64>,
    watts: Option<f64>,
}

/// Mean SM clock and power over a window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Reading {
    pub mhz: Option<f64>,
    pub watts: Option<f64>,
    /// Samples that fell in the window.
    pub samples: usize,
}

impl Reading {
    /// `MHz/W` as the tables print it, `n/a` for what is missing.
    pub fn label(&self) -> String {
        let show = |value: Option<f64>| value.map_or("n/a".to_string(), |v| format!("{v:.0}"));
        format!("{}/{}", show(self.mhz), show(self.watts))
    }
}

/// Samples kept: about a minute at [`SAMPLE_PERIOD`], far more than any row's
/// timed calls take.
const MAX_SAMPLES: usize = 6000;
/// How often the thread samples.
const SAMPLE_PERIOD: Duration = Duration::from_millis(10);

type Samples = Arc<Mutex<VecDeque<Sample>>>;

/// A thread sampling NVML every [`SAMPLE_PERIOD`] for the life of the
/// benchmark; [`Monitor::mean`] averages the samples of a window.
pub struct Monitor {
    nvml: Option<Arc<Nvml>>,
    samples: Samples,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// `NVML: <device>, driver <version>`, or why the clock and power read
    /// n/a.
    pub status: String,
}

impl Monitor {
    /// Starts sampling `nvml`, or, where it could not be opened, a monitor
    /// whose readings are all n/a and whose status says why.
    pub fn start(nvml: Result<Nvml, String>) -> Monitor {
        let samples: Samples = Arc::new(Mutex::new(VecDeque::with_capacity(MAX_SAMPLES)));
        let stop = Arc::new(AtomicBool::new(false));
        match nvml {
            Err(reason) => Monitor {
                nvml: None,
                samples,
                stop,
                thread: None,
                status: format!("NVML: n/a, SM clock and power not measured: {reason}"),
            },
            Ok(nvml) => {
                let status = format!("NVML: {}, driver {}", nvml.name, nvml.driver);
                let nvml = Arc::new(nvml);
                let thread = {
                    let (nvml, samples, stop) = (nvml.clone(), samples.clone(), stop.clone());
                    std::thread::spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            push(&samples, &nvml);
                            std::thread::sleep(SAMPLE_PERIOD);
                        }
                    })
                };
                Monitor { nvml: Some(nvml), samples, stop, thread: Some(thread), status }
            }
        }
    }

    /// Whether clock and power are measured.
    pub fn available(&self) -> bool {
        self.nvml.is_some()
    }

    /// The device name and driver version, where NVML gave them.
    pub fn device(&self) -> Option<(&str, &str)> {
        self.nvml.as_deref().map(|n| (n.name.as_str(), n.driver.as_str()))
    }

    /// One sample now, beside the thread's (at the edges of a window, so that
    /// even a window shorter than the sampling period has samples).
    pub fn sample_now(&self) {
        if let Some(nvml) = &self.nvml {
            push(&self.samples, nvml);
        }
    }

    /// Mean clock and power of the samples taken in `window` ([`now`]
    /// seconds, both ends included).
    pub fn mean(&self, window: (f64, f64)) -> Reading {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        mean_of(samples.iter().copied(), window)
    }
}

fn push(samples: &Samples, nvml: &Nvml) {
    let (mhz, watts) = nvml.read();
    let sample = Sample { t: now(), mhz, watts };
    let mut samples = samples.lock().unwrap_or_else(|e| e.into_inner());
    if samples.len() == MAX_SAMPLES {
        samples.pop_front();
    }
    samples.push_back(sample);
}

/// The mean of each of clock and power over the samples in `window`.
fn mean_of(samples: impl Iterator<Item = Sample>, (from, to): (f64, f64)) -> Reading {
    let (mut mhz, mut watts, mut count) = ((0.0, 0usize), (0.0, 0usize), 0);
    for sample in samples.filter(|s| s.t >= from && s.t <= to) {
        count += 1;
        if let Some(m) = sample.mhz {
            mhz = (mhz.0 + m, mhz.1 + 1);
        }
        if let Some(w) = sample.watts {
            watts = (watts.0 + w, watts.1 + 1);
        }
    }
    let average = |(sum, n): (f64, usize)| (n > 0).then(|| sum / n as f64);
    Reading { mhz: average(mhz), watts: average(watts), samples: count }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_of_a_window() {
        let samples = [
            Sample { t: 0.5, mhz: Some(1980.0), watts: Some(100.0) },
            Sample { t: 1.0, mhz: Some(1800.0), watts: Some(480.0) },
            Sample { t: 1.5, mhz: Some(1760.0), watts: None },
            Sample { t: 2.0, mhz: None, watts: Some(470.0) },
            Sample { t: 2.5, mhz: Some(1980.0), watts: Some(90.0) },
        ];
        let reading = mean_of(samples.iter().copied(), (1.0, 2.0));
        assert_eq!(reading.samples, 3);
        assert_eq!(reading.mhz, Some(1780.0));
        assert_eq!(reading.watts, Some(475.0));
        assert_eq!(reading.label(), "1780/475");
        let empty = mean_of(samples.iter().copied(), (3.0, 4.0));
        assert_eq!(empty, Reading { mhz: None, watts: None, samples: 0 });
        assert_eq!(empty.label(), "n/a/n/a");
    }

    #[test]
    fn missing_library_is_an_error_not_a_panic() {
        let error = Nvml::open_library("libnvidia-ml-that-is-not-there.so.1", None).err().unwrap();
        assert!(error.starts_with("cannot load libnvidia-ml-that-is-not-there.so.1"), "{error}");
        let monitor = Monitor::start(Err(error));
        assert!(!monitor.available());
        assert!(monitor.status.starts_with("NVML: n/a"), "{}", monitor.status);
        monitor.sample_now();
        assert_eq!(monitor.mean((0.0, f64::MAX)).label(), "n/a/n/a");
    }

    /// With `FAKE_NVML=/path/libfake.so` (a stand-in library with NVML's
    /// functions, see scripts/test-bench-cpu.sh): opens it, samples and
    /// averages.
    #[test]
    fn fake_library_samples() {
        let Ok(path) = std::env::var("FAKE_NVML") else {
            eprintln!("FAKE_NVML not set: skipped");
            return;
        };
        let nvml = Nvml::open_library(&path, Some("00000000:3B:00.0")).unwrap();
        assert_eq!(nvml.name, "Fake H100");
        assert_eq!(nvml.driver, "999.1");
        let monitor = Monitor::start(Ok(nvml));
        assert!(monitor.available());
        let from = now();
        std::thread::sleep(Duration::from_millis(55));
        monitor.sample_now();
        let reading = monitor.mean((from, now()));
        assert!(reading.samples >= 4, "{reading:?}");
        assert_eq!(reading.mhz, Some(1837.0));
        assert_eq!(reading.watts, Some(478.25));
        assert_eq!(reading.label(), "1837/478");
    }
}

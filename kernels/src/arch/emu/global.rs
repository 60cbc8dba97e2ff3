//! Global memory: host memory the launcher was told the kernel may use.
//! Every global access is checked against that list before it touches a
//! byte, so an out-of-bounds index is reported instead of read.

use std::panic::Location;

use super::error::{Fault, FaultKind};

/// One allocation the kernel may access: `len` bytes at `base`.
#[derive(Clone, Copy, Debug)]
pub struct GlobalRegion {
    /// Named in fault messages.
    pub name: &'static str,
    pub base: usize,
    pub len: usize,
    pub writable: bool,
}

impl GlobalRegion {
    /// The bytes of `data`, which the kernel may only read.
    pub fn read_only<T>(name: &'static str, data: &[T]) -> Self {
        Self { name, base: data.as_ptr() as usize, len: std::mem::size_of_val(data), writable: false }
    }

    /// The bytes of `data`, which the kernel may read and write.
    pub fn writable<T>(name: &'static str, data: &mut [T]) -> Self {
        Self { name, base: data.as_mut_ptr() as usize, len: std::mem::size_of_val(data), writable: true }
    }

    fn end(&self) -> usize {
        self.base + self.len
    }
}

/// The registered allocations of one launch.
pub(crate) struct GlobalMemory {
    regions: Vec<GlobalRegion>,
}

/// One global access, as fault messages describe it.
pub(crate) struct Access {
    pub instruction: &'static str,
    pub site: &'static Location<'static>,
    pub thread: u32,
    pub addr: usize,
    pub len: usize,
    pub align: usize,
    pub write: bool,
}

impl GlobalMemory {
    pub fn new(regions: &[GlobalRegion]) -> Self {
        Self { regions: regions.to_vec() }
    }

    /// Checks that `access` lies within one registered allocation that
    /// allows it.
    pub fn check(&self, access: &Access) -> Result<(), Fault> {
        let what = format!(
            "{} at {} {} {} bytes at {:#x}",
            access.instruction,
            access.site,
            if access.write { "writes" } else { "reads" },
            access.len,
            access.addr
        );
        let fault = |kind, message| Err(Fault::new(kind, Some(access.thread), message));
        if !access.addr.is_multiple_of(access.align) {
            return fault(FaultKind::Misaligned, format!("{what}, not {}-byte aligned", access.align));
        }
        let end = access.addr.saturating_add(access.len);
        let Some(region) = self.regions.iter().find(|r| r.base <= access.addr && end <= r.end()) else {
            return fault(
                FaultKind::GlobalOutOfBounds,
                format!("{what}, outside every registered allocation; {}", self.nearest(access.addr, end)),
            );
        };
        if access.write && !region.writable {
            return fault(FaultKind::GlobalReadOnly, format!("{what}, in '{}', which is read-only", region.name));
        }
        Ok(())
    }

    /// Says where `addr..end` lies relative to the closest allocation.
    fn nearest(&self, addr: usize, end: usize) -> String {
        let distance = |r: &GlobalRegion| {
            if end <= r.base {
                r.base - end
            } else if addr >= r.end() {
                addr - r.end()
            } else {
                0
            }
        };
        match self.regions.iter().min_by_key(|r| distance(r)) {
            None => "no allocation is registered".into(),
            Some(r) => {
                let place = if addr < r.base {
                    format!("starts {} bytes before", r.base - addr)
                } else {
                    format!("ends {} bytes past the end of", end - r.end())
                };
                format!("it {place} '{}' [{:#x}, {:#x}) ({} bytes)", r.name, r.base, r.end(), r.len)
            }
        }
    }
}

//! What a planned call will run, in a form for callers and logs: the
//! kernel family, the main kernel's entry point and grid, and every launch
//! in order ([`CallPlan`], from [`FlashAttention::explain_forward`] and
//! friends).
//!
//! [`FlashAttention::explain_forward`]: crate::FlashAttention::explain_forward

use std::fmt;

use super::kernels::{Kernel, Launch};

/// The kernel family a call runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// The sm_80 kernels (`mma.sync`, `cp.async`), which run on every GPU
    /// of compute capability 8.0 and up.
    Sm80,
    /// The sm_90a kernels (`wgmma`, TMA, warp specialization), on compute
    /// capability 9.0 (H100, H200).
    Sm90a,
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::Sm80 => "sm_80",
            Family::Sm90a => "sm_90a",
        })
    }
}

/// One kernel launch of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedLaunch {
    /// The PTX entry point.
    pub kernel: &'static str,
    pub grid: [u32; 3],
    pub threads: u32,
    /// Dynamic shared memory, bytes.
    pub smem_bytes: u32,
}

/// What a call will run, decided without launching anything: the family
/// and the main kernel (the attention kernel of a forward call, the main
/// backward kernel of a backward call) with its grid, and every launch of
/// the call in order (a KV cache append before the attention, a split-KV
/// merge after it; the backward's row kernels around its main kernel).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallPlan {
    pub family: Family,
    /// The main kernel's PTX entry point.
    pub kernel: &'static str,
    /// The main kernel's grid (its first launch's, where it runs several
    /// times: the deterministic backward).
    pub grid: [u32; 3],
    pub launches: Vec<PlannedLaunch>,
}

impl CallPlan {
    /// The plan of `launches`, whose main kernel is `main`.
    pub(crate) fn new(family: Family, main: Kernel, launches: &[Launch]) -> Self {
        let grid = launches.iter().find(|l| l.kernel == main).map_or([0; 3], |l| l.grid);
        let launches = launches
            .iter()
            .map(|l| PlannedLaunch {
                kernel: l.kernel.name(),
                grid: l.grid,
                threads: l.threads,
                smem_bytes: l.smem_bytes,
            })
            .collect();
        CallPlan { family, kernel: main.name(), grid, launches }
    }
}

impl fmt::Display for CallPlan {
    /// `sm_90a flash_fwd_sm90_d128_f16_full, grid [132, 1, 1]`, then the
    /// launches when there are several.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}, grid {:?}", self.family, self.kernel, self.grid)?;
        if self.launches.len() > 1 {
            let names: Vec<&str> = self.launches.iter().map(|l| l.kernel).collect();
            write!(f, " (launches: {})", names.join(", "))?;
        }
        Ok(())
    }
}

//! What runs for a validated [`Call`], as a pure function of it, decided
//! once: a [`Plan`] (forward) or a [`BackwardPlan`], each an enum of the
//! kernel family that runs the call, with the kernels, grids, scratch and
//! argument blocks of that family. The launch binds the output and scratch
//! addresses and runs the result.
//!
//! - `params.rs`: the call's argument block ([`ForwardParams`]: built
//!   there and nowhere else) and which calls need a general kernel;
//! - `sm80.rs`: the sm_80 forward plan (the split heuristic, the GQA
//!   decode layout, the kernel variant, the split-KV merge);
//! - `sm90.rs`: the sm_90a forward plan (which calls it takes, its tile
//!   height, the persistent grid and its tile order);
//! - `backward.rs`: both backward plans;
//! - `tma.rs`: the tensor maps of the sm_90a kernels;
//! - `kernels.rs`: the kernels a plan names, and its [`Launch`]es;
//! - `describe.rs`: [`CallPlan`], the public description of a plan.

mod backward;
mod describe;
mod kernels;
mod params;
mod sm80;
mod sm90;
mod tma;

use flash_attn_abi::kernels::AttentionKernel;
use flash_attn_abi::params::ForwardParams;

use crate::call::{BackwardCall, Call};
use crate::error::Result;

pub use backward::{BackwardRows, Sm80Backward, Sm90Backward, MAX_DETERMINISTIC_LAUNCHES};
pub use describe::{CallPlan, Family, PlannedLaunch};
pub use kernels::{Kernel, KernelArgs, Launch, OutputAddrs};
pub use sm80::{num_splits_heuristic, ScratchLayout, Sm80Plan, MIN_KEY_BLOCKS_PER_SPLIT};
pub use sm90::{block_m as sm90_block_m, Sm90Plan};

/// The kernel families a plan may choose from: what the GPU runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFamily {
    /// The sm_80 kernels only (every GPU of compute capability 8.0 and up).
    Sm80,
    /// The sm_90a kernels for the calls they take, else the sm_80 ones
    /// (compute capability 9.0), on a GPU of `sm_count` SMs: the persistent
    /// sm_90a blocks run one per SM.
    Sm90a { sm_count: usize },
}

/// A planned forward call: what runs, on one family.
// One plan lives per call, on the stack, moved once: boxing the sm_90a
// variant (its tensor maps) would add an allocation to every call.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Plan {
    /// The sm_80 kernels: a KV cache append, the attention kernel, a
    /// split-KV merge.
    Sm80(Sm80Plan),
    /// One persistent sm_90a kernel.
    Sm90(Sm90Plan),
}

/// Plans `call` on the sm_80 kernels ([`plan_for`] with [`KernelFamily::Sm80`]).
pub fn plan(call: &Call, wave: impl Fn(&AttentionKernel) -> usize) -> Result<Plan> {
    plan_for(call, wave, KernelFamily::Sm80)
}

/// Plans `call` for a GPU of `family`: with [`KernelFamily::Sm90a`], the
/// sm_90a kernel where it takes the call and the call is not a decode call
/// (the sm_80 decode kernels take those); else the sm_80 kernels, with the
/// split heuristic taking `wave` CTAs of a kernel to run at once.
pub fn plan_for(call: &Call, wave: impl Fn(&AttentionKernel) -> usize, family: KernelFamily) -> Result<Plan> {
    if let KernelFamily::Sm90a { sm_count } = family {
        if !sm80::is_decode(call) {
            if let Some(plan) = sm90::plan(call, sm_count) {
                return Ok(Plan::Sm90(plan));
            }
        }
    }
    sm80::plan(call, wave).map(Plan::Sm80)
}

impl Plan {
    /// The launches of the call, in order, with the outputs at `outputs`
    /// and the scratch at `scratch` (at least [`Self::scratch_bytes`],
    /// 256-byte aligned, what the launch uploads already written there).
    pub fn launches(&self, outputs: OutputAddrs, scratch: u64) -> Vec<Launch> {
        match self {
            Plan::Sm80(plan) => plan.launches(outputs, scratch),
            Plan::Sm90(plan) => plan.launches(outputs, scratch),
        }
    }

    /// The scratch memory the call needs, bytes (0: none).
    pub fn scratch_bytes(&self) -> usize {
        match self {
            Plan::Sm80(plan) => plan.scratch.bytes,
            Plan::Sm90(plan) => plan.scratch_bytes,
        }
    }

    /// The attention kernel.
    pub fn kernel(&self) -> Kernel {
        match self {
            Plan::Sm80(plan) => Kernel::Attention(plan.kernel),
            Plan::Sm90(plan) => Kernel::Hopper(plan.kernel),
        }
    }

    /// The attention kernel's argument block (the portable one of an
    /// sm_90a kernel), outputs and scratch not bound.
    pub fn args(&self) -> &ForwardParams {
        match self {
            Plan::Sm80(plan) => &plan.args,
            Plan::Sm90(plan) => &plan.args,
        }
    }

    pub fn family(&self) -> Family {
        match self {
            Plan::Sm80(_) => Family::Sm80,
            Plan::Sm90(_) => Family::Sm90a,
        }
    }

    /// What the call will run.
    pub fn describe(&self) -> CallPlan {
        CallPlan::new(self.family(), self.kernel(), &self.launches(OutputAddrs { o: 0, lse: 0 }, 0))
    }
}

/// A planned backward call: the row kernels and, between them, the main
/// kernel of one family.
#[allow(clippy::large_enum_variant)] // as for `Plan`
#[derive(Clone, Copy, Debug)]
pub enum BackwardPlan {
    Sm80(Sm80Backward),
    Sm90(Sm90Backward),
}

/// Plans the backward `call` on the sm_80 kernels of a GPU of `sm_count`
/// SMs ([`plan_backward_for`] with [`KernelFamily::Sm80`]).
pub fn plan_backward(call: &BackwardCall, sm_count: usize) -> Result<BackwardPlan> {
    plan_backward_for(call, sm_count, KernelFamily::Sm80)
}

/// Plans the backward `call` on a GPU of `sm_count` SMs of `family`: with
/// [`KernelFamily::Sm90a`], the sm_90a main kernel where it takes the
/// call; else the sm_80 one.
pub fn plan_backward_for(call: &BackwardCall, sm_count: usize, family: KernelFamily) -> Result<BackwardPlan> {
    if let KernelFamily::Sm90a { .. } = family {
        if let Some(plan) = backward::sm90(call)? {
            return Ok(BackwardPlan::Sm90(plan));
        }
    }
    backward::sm80(call, sm_count).map(BackwardPlan::Sm80)
}

impl BackwardPlan {
    /// The launches in order (prepare, the main kernel, finish dQ) with
    /// the scratch at `scratch` (at least [`Self::scratch_bytes`], 256-byte
    /// aligned, the sm_90a tensor maps already written there).
    pub fn launches(&self, scratch: u64) -> Vec<Launch> {
        match self {
            BackwardPlan::Sm80(plan) => plan.launches(scratch),
            BackwardPlan::Sm90(plan) => plan.launches(scratch),
        }
    }

    /// The scratch memory the call needs, bytes.
    pub fn scratch_bytes(&self) -> usize {
        match self {
            BackwardPlan::Sm80(plan) => plan.scratch_bytes(),
            BackwardPlan::Sm90(plan) => plan.scratch_bytes(),
        }
    }

    /// The row kernels, their arguments and scratch.
    pub fn rows(&self) -> &BackwardRows {
        match self {
            BackwardPlan::Sm80(plan) => &plan.rows,
            BackwardPlan::Sm90(plan) => &plan.rows,
        }
    }

    /// The main kernel.
    pub fn kernel(&self) -> Kernel {
        match self {
            BackwardPlan::Sm80(plan) => Kernel::Backward(plan.kernel),
            BackwardPlan::Sm90(plan) => Kernel::HopperBackward(plan.kernel),
        }
    }

    pub fn family(&self) -> Family {
        match self {
            BackwardPlan::Sm80(_) => Family::Sm80,
            BackwardPlan::Sm90(_) => Family::Sm90a,
        }
    }

    /// What the call will run.
    pub fn describe(&self) -> CallPlan {
        CallPlan::new(self.family(), self.kernel(), &self.launches(0))
    }
}

#[cfg(test)]
mod tests;

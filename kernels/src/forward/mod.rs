//! The forward kernels: [`sm80`] (`mma.sync`, `cp.async`; every GPU from
//! sm_80, every feature) and [`sm90`] (TMA, `wgmma`, warp specialization;
//! sm_90a, the calls it takes).

pub mod sm80;
pub mod sm90;

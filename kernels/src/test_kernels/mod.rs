//! Test-only kernels, in the test PTX modules and never in the one users
//! embed: [`probe`] one warp running each primitive, to check the emulator
//! on a GPU; [`probe_sm90`] the same for the sm_90a primitives (three
//! warpgroups); [`ceiling`] register-only MMAs, the benchmark's ceiling.

pub mod ceiling;
pub mod probe;
pub mod probe_sm90;

//! The sm_80 main backward kernel: [`key_block::backward_key_block`], one
//! block per key block, which walks the query steps that see it and
//! accumulates dK and dV in registers and dQ in the f32 accumulator
//! (atomics). [`fragments`] reads the tiles as the `mma.sync` operands the
//! products need, transposed or not.

pub mod fragments;
pub mod key_block;

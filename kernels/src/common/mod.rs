//! What the kernel families share: the element types ([`element`]), the
//! sm_80 shared-memory tiles and their swizzle ([`layout`]), global <->
//! shared copies ([`tile_copy`]), the `mma.sync` fragments and products
//! ([`mma`]), the online softmax, masks and score modifiers ([`softmax`]),
//! and each block's problem: sequences, visibility, pages ([`problem`]).

pub mod element;
pub mod layout;
pub mod mma;
pub mod problem;
pub mod softmax;
pub mod tile_copy;

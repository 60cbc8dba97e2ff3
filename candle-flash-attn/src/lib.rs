//! [flash-attn-candle](flash_attn_candle) under the name of
//! [candle-flash-attn](https://crates.io/crates/candle-flash-attn), at the
//! version candle-transformers asks for, so that one `[patch]` line in a
//! program's `Cargo.toml` moves every crate that calls `candle_flash_attn`
//! (candle-transformers' models with its `flash-attn` feature: Llama,
//! Mistral, Qwen, Gemma, Phi, ...) onto flash-attn's pure-Rust kernels:
//!
//! ```toml
//! [patch.crates-io]
//! candle-flash-attn = { git = "<this repository's URL>" }
//! ```
//!
//! Nothing but a re-export: every item is flash-attn-candle's.

pub use flash_attn_candle::*;

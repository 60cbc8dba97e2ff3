//! The seeds of the random tests, so that any failure can be replayed.
//! `FLASH_ATTN_TEST_SEED` sets them: the GPU tests' generators ([`test_rng`],
//! which otherwise draws a seed and prints it, with the line that replays
//! it: the harness shows it with a failing test's output), and the base that
//! every emulator test's random tensors add to their own fixed seeds
//! ([`emulator_base`], 0 without it: CI runs the same cases every time). The
//! emulator tests' random calls (proptest) take `PROPTEST_RNG_SEED`.

use rand::rngs::StdRng;
use rand::SeedableRng;

/// The environment variable that sets every random test's base seed.
pub const SEED_VAR: &str = "FLASH_ATTN_TEST_SEED";

fn from_env() -> Option<u64> {
    let value = std::env::var(SEED_VAR).ok()?;
    match value.trim().parse() {
        Ok(seed) => Some(seed),
        Err(_) => panic!("{SEED_VAR}={value} is not a u64"),
    }
}

fn announce(test: &str, seed: u64, how: &str) -> u64 {
    eprintln!("SEED {test}: {seed} ({how}; replay with {SEED_VAR}={seed})");
    seed
}

/// The base seed every emulator test's random tensors add to their own:
/// [`SEED_VAR`], else 0.
pub fn emulator_base() -> u64 {
    from_env().unwrap_or(0)
}

/// The base seed of the GPU test `test`: [`SEED_VAR`], else drawn.
pub fn drawn_seed(test: &str) -> u64 {
    match from_env() {
        Some(seed) => announce(test, seed, SEED_VAR),
        None => announce(test, rand::random(), "drawn"),
    }
}

/// A generator of the GPU test `test`, seeded by [`drawn_seed`].
pub fn test_rng(test: &str) -> StdRng {
    StdRng::seed_from_u64(drawn_seed(test))
}

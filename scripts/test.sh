#!/usr/bin/env bash
# The test suite, from a fresh clone: installs what it needs (scripts/setup.sh),
# and what the candle crate needs (scripts/candle-setup.sh), then checks
# formatting, lints, that the committed PTX is fresh and spill-free
# (ptxas), and runs every test. The GPU tests run on a GPU and otherwise print
# that they were skipped and why; everything else asserts on the CPU, including
# the kernels' own code run on the CPU emulator through the host's pipeline
# (tests/tests/emulator_attention.rs) and the emulator's own tests
# (kernels/tests), then the validation property test once more in a debug
# build with overflow checks, the benchmark's CPU tests, and the packaging of
# the user-facing crates.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
# The candle crate (candle/) builds candle-core's `cuda` feature: nvcc and
# the CUDA libraries it links, from PyPI wheels, and a libcuda stub.
. scripts/candle-setup.sh
echo "== cargo fmt --check"
cargo fmt --all --check
(cd kernels && cargo fmt --check)
echo "== cargo clippy"
cargo clippy --workspace --all-targets --release -- -D warnings
cargo clippy --manifest-path kernels/Cargo.toml --all-targets --release -- -D warnings
echo "== PTX fresh and free of spills"
cargo xtask build-ptx --check --require-ptxas
echo "== cargo test"
log="$(mktemp)"
cargo test --workspace --release 2>&1 | tee "$log"
echo "== the CPU emulator itself (primitives, fault reports)"
cargo test --manifest-path kernels/Cargo.toml --release 2>&1 | tee -a "$log"
# The validation property test (host/src/bounds_tests.rs) again, in a debug
# build with overflow checks, where any overflow in validation panics: random
# calls through every validation entry point and the launch plan, whatever is
# accepted checked against every index the kernels compute. About 30 s for
# its PROPTEST_CASES (default 60000); counted once above, in the release run.
echo "== validation property test, debug build with overflow checks"
CARGO_PROFILE_DEV_OVERFLOW_CHECKS=true cargo test -p flash-attn --lib bounds_tests
# The benchmark's CPU-side tests: its timing against a simulated GPU, NVML
# through a stand-in library, bench_torch.py's tables with stand-in peers.
echo "== benchmark, CPU side"
bash scripts/test-bench-cpu.sh
# The user-facing crates package, with the committed PTX inside, and build
# from their packages.
echo "== cargo package"
# cargo verifies flash-attn against the packaged flash-attn-abi through a local
# registry. It keys that crate's unpacked source (in CARGO_HOME) and its build
# (in target/debug) by checkout path and version, not by content, so a machine
# that packaged an older 0.1.0 from the same path, as a CI machine does,
# verifies against the stale copy. Our crates never come from crates.io: their
# unpacked copies and debug builds (where cargo verifies) go first.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/flash-attn-[0-9]* \
  "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/flash-attn-abi-[0-9]*
cargo clean --profile dev -p flash-attn-abi
cargo package --allow-dirty -p flash-attn-abi -p flash-attn
# The cudarc door alone (default features off: no cust, nothing linked):
# lints and the library's tests in that build, then a user's
# program on it built on stable, outside the workspace, with no CUDA.
echo "== the cudarc door without cust"
cargo clippy -p flash-attn --no-default-features --features cudarc --all-targets --release -- -D warnings
# (The doc examples show the cust door; the workspace run above compiled
# them, and the cudarc one, with both doors.)
cargo test -p flash-attn --no-default-features --features cudarc --release --lib 2>&1 | tee -a "$log"
bash scripts/test-consumer.sh
# A program that pins cudarc's CUDA version (13.0, 12.8) keeps it, and the
# cudarc door compiles against the bindings of every version cudarc knows:
# flash-attn leaves the version to the program (issue 65).
echo "== cudarc CUDA versions"
bash scripts/test-cudarc-versions.sh
# candle-transformers (its current 0.11 release, feature flash-attn) on our
# candle-flash-attn by one [patch] line, in a program the candle GPU bundle
# runs (its Llama, use_flash_attn on and off).
echo "== candle-transformers through [patch.crates-io]"
bash scripts/test-candle-transformers.sh
# Totals over every test binary; GPU tests that found no GPU count as skipped.
read -r passed failed < <(awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed;/) p += $i; if ($(i+1) ~ /^failed;/) f += $i } } END { print p + 0, f + 0 }' "$log")
skipped=$(grep -c '^SKIPPED ' "$log" || true)
rm -f "$log"
echo "summary: $((passed - skipped)) passed, $failed failed, $skipped skipped"

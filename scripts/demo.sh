#!/usr/bin/env bash
# The main job, from a fresh clone: sets up, then runs attention on the GPU
# against the f64 reference (host/examples/demo.rs). Without a usable GPU it
# says so and runs the same kernel code on the CPU emulator instead, on a
# small shape, through the same validation and plan
# (tests/examples/emulate.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
status=0
cargo run --quiet --release -p flash-attn --example demo || status=$?
if [ "$status" = 2 ]; then
  echo "demo: no GPU here, so running the kernels' own Rust code on the CPU emulator instead (small shape):"
  exec cargo run --quiet --release -p flash-attn-tests --example emulate
fi
exit "$status"

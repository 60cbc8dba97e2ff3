#!/usr/bin/env bash
# The main job, from a fresh clone: sets up, then runs attention on the GPU
# against the f64 reference (host/examples/demo.rs), or says what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
if [ -d .tools/cuda/lib64 ]; then
  export LD_LIBRARY_PATH="$PWD/.tools/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
exec cargo run --quiet --release -p flash-attn --example demo

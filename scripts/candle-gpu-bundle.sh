#!/usr/bin/env bash
# Builds the candle crate's GPU tests, benchmark and examples (train,
# decode), and the candle-transformers program of
# scripts/test-candle-transformers.sh (release) into gpu-bundle-candle/, with
# a runner for a GPU machine that has no Rust:
#   bash scripts/candle-gpu-bundle.sh            # here
#   bash gpu-bundle-candle/run.sh [ITERS]        # there (results in $OUT or gpu-bundle-candle/results)
# Kept apart from `cargo xtask gpu-bundle`: these executables link
# candle's CUDA libraries (cuBLAS, cuRAND, NVRTC, the runtime), which the
# runner finds in the GPU image's Python wheels (nvidia/cu13/lib), and they
# are built in their own cargo invocation, so that the flash-attn test
# executables of the main bundle keep their features.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
. scripts/setup.sh
. scripts/candle-setup.sh
bundle="$root/gpu-bundle-candle"
rm -rf "$bundle"
mkdir -p "$bundle/bin"
json="$(nice -n 15 cargo test --release --no-run --message-format=json -p flash-attn-candle --test gpu)"
exe="$(printf '%s\n' "$json" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("executable") and m.get("profile", {}).get("test"):
        print(m["executable"])
')"
cp "$exe" "$bundle/bin/test-candle-gpu"
nice -n 15 cargo build --release -p flash-attn-candle --example bench --example train --example decode
cp target/release/examples/bench "$bundle/bin/bench-candle"
cp target/release/examples/train "$bundle/bin/train-candle"
cp target/release/examples/decode "$bundle/bin/decode-candle"
transformers="$(bash scripts/test-candle-transformers.sh | tail -n1)"
cp "$transformers" "$bundle/bin/candle-transformers-check"
# Without their symbols the executables travel in a fraction of the size.
strip "$bundle"/bin/*
cat > "$bundle/run.sh" <<'EOF'
#!/usr/bin/env bash
# The candle crate's GPU tests and benchmark on a GPU machine (see
# scripts/candle-gpu-bundle.sh). candle's CUDA libraries come from the
# image's Python wheels; the driver's libcuda.so.1 from the system.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
results="${OUT:-$here/results}"
mkdir -p "$results"
[ -f "$here/bin.tar.xz" ] && { rm -rf "$here/bin"; tar xJf "$here/bin.tar.xz" -C "$here"; }
libs="$(python3 - <<'PY'
import os
try:
    import nvidia
    for p in nvidia.__path__:
        d = os.path.join(p, "cu13", "lib")
        if os.path.exists(os.path.join(d, "libcublas.so.13")):
            print(d)
            break
except ImportError:
    pass
PY
)"
[ -n "$libs" ] || libs="$(dirname "$(find / -name libcublas.so.13 -print -quit 2>/dev/null)")"
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "candle libraries: $libs"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$results/gpu.txt"
status=0
"$here/bin/test-candle-gpu" --test-threads=1 2>&1 | tee "$results/tests.log" || status=1
grep -q "^test result: ok" "$results/tests.log" || status=1
# The examples: training steps through candle's backward (gradients against
# candle's f64 attention, the loss must fall), a prefill + KV-cache decode
# program (every output against candle's attention), and candle-transformers'
# Llama with use_flash_attn on and off against an f32 run.
for run in train-candle decode-candle candle-transformers-check; do
  echo "== $run"
  "$here/bin/$run" 2>&1 | tee "$results/$run.log"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "$run: FAILED"; status=1; }
done
# The SM clock and board power over the benchmark (every 200 ms).
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 200 > "$results/clocks.csv" 2>/dev/null &
monitor=$!
"$here/bin/bench-candle" "${1:-20}" 2>&1 | tee "$results/bench.md" || status=1
kill "$monitor" 2>/dev/null
awk -F', *' '$1 > 0 { n++; c += $1; p += $2; if ($1 < cmin || n == 1) cmin = $1; if ($1 > cmax) cmax = $1; if ($2 > pmax) pmax = $2 }
  END { if (n) printf "SM clock over the benchmark: mean %.0f MHz (%d-%d), power mean %.0f W (max %.0f), %d samples\n", c / n, cmin, cmax, p / n, pmax, n }' \
  "$results/clocks.csv" | tee -a "$results/bench.md"
echo "candle GPU check: $([ $status = 0 ] && echo passed || echo FAILED)"
exit $status
EOF
# Every executable holds candle's kernels and ours (about 60 MB of each one's
# 60-70): a dictionary wider than one executable compresses the repeats away
# (about 8 MB for the five rather than 31; 256 MiB of memory to unpack).
(cd "$bundle" && tar cf - bin | nice -n 15 xz -T1 --lzma2=preset=6,dict=256MiB > bin.tar.xz && rm -rf bin)
echo "candle-gpu-bundle: $bundle ($(du -sh "$bundle" | cut -f1)); on the GPU machine: bash gpu-bundle-candle/run.sh"

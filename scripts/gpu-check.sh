#!/usr/bin/env bash
# The full GPU check, in one call on a GPU machine with no Rust: the GPU
# tests, compute-sanitizer memcheck on a ragged causal GQA case, and the
# benchmark beside torch's SDPA flash (FlashAttention-2) and cuDNN backends.
# Build the bundle first, here: `cargo xtask gpu-bundle`.
# usage: bash gpu-bundle/gpu-check.sh [--quick-bench]   (results in $OUT or gpu-bundle/results)
set -u
quick_bench=0
[ "${1:-}" = "--quick-bench" ] && quick_bench=1
here="$(cd "$(dirname "$0")" && pwd)"
results="${OUT:-$here/results}"
mkdir -p "$results"
# The executables travel compressed (xtask gpu-bundle).
if [ -f "$here/bin.tar.gz" ]; then
  rm -rf "$here/bin" && tar xzf "$here/bin.tar.gz" -C "$here" || { echo "gpu-check: cannot unpack bin.tar.gz"; exit 1; }
fi
rm -f "$results/tests.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$results/gpu.txt"

tests_failed=0
tests_passed=0
for t in "$here"/bin/test-*; do
  name="$(basename "$t")"
  echo "== $name"
  if "$t" --test-threads=4 --nocapture > "$results/$name.log.tmp" 2>&1; then
    tests_passed=$((tests_passed + 1))
  else
    tests_failed=$((tests_failed + 1))
    echo "FAILED: $name"
  fi
  grep -E "^test result|SKIPPED|panicked|FAILED" "$results/$name.log.tmp" | head -20
  { echo "== $name"; cat "$results/$name.log.tmp"; } >> "$results/tests.log"
  rm "$results/$name.log.tmp"
done

echo "== demo"
if "$here/bin/demo" > "$results/demo.log" 2>&1; then demo="ok"; else demo="FAILED"; fi
cat "$results/demo.log"

gpu_test="$(ls "$here"/bin/test-flash-attn-tests-test-gpu_forward* | head -n1)"
features_test="$(ls "$here"/bin/test-flash-attn-tests-test-gpu_features* | head -n1)"
memcheck="clean"
# A ragged causal GQA case of the dense kernels, then paged KV caches with
# appends and split-KV (general and decode kernels, combine, append).
for run in "$gpu_test memcheck_ragged_causal_gqa" "$features_test f16_paged_kv_cache" "$features_test stale_cache_slots_are_never_read"; do
  set -- $run
  echo "== compute-sanitizer memcheck on $2"
  if ! compute-sanitizer --tool memcheck --error-exitcode 9 "$1" "$2" --exact --nocapture > "$results/memcheck-$2.log" 2>&1; then
    memcheck="FAILED"
  fi
  tail -3 "$results/memcheck-$2.log"
done

echo "== benchmark"
bench_args=()
[ "$quick_bench" = 1 ] && bench_args+=(--quick)
bench="FAILED"
# The standard grid (d 64 and 128), then prefill rows for the other head dims.
if "$here/bin/bench" --out "$results/ours.jsonl" "${bench_args[@]}" && \
   "$here/bin/bench" --out "$results/other.jsonl" --head-dims 32,96,160,192,224,256 --seqlens 1024,4096 && \
   cat "$results/other.jsonl" >> "$results/ours.jsonl" && rm "$results/other.jsonl" && \
   python3 "$here/bench_torch.py" "$results/ours.jsonl" --markdown "$results/bench.md" > "$results/bench_torch.log"; then
  bench="done"
  cat "$results/bench.md"
fi
echo "gpu-check: test executables $tests_passed passed, $tests_failed failed; demo $demo; memcheck $memcheck; benchmark $bench"
[ "$tests_failed" = 0 ] && [ "$demo" = ok ] && [ "$memcheck" = clean ] && [ "$bench" = done ]

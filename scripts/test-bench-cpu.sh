#!/usr/bin/env bash
# The benchmark's parts that run without a GPU, on this machine:
#   - bench's unit tests (argument parsing, the hot timing against a
#     simulated GPU, the NVML monitor), once with a stand-in libnvidia-ml
#     built here from the C below (fixed clock 1837 MHz, power 478.25 W);
#   - bench_torch.py's tests (scripts/test_bench_torch.py: the hot timing
#     against a simulated GPU, the tables from a JSONL, peers that fail or
#     are missing, with stand-in torch and pynvml modules) and a byte-compile
#     of the GPU scripts.
# usage: . scripts/setup.sh && bash scripts/test-bench-cpu.sh
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cat > "$work/fake_nvml.c" <<'C'
#include <string.h>
typedef void *nvmlDevice_t;
static int device;
int nvmlInit_v2(void) { return 0; }
int nvmlInitWithFlags(unsigned flags) { return 0; } /* what pynvml's nvmlInit calls */
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int status) { return status ? "fake error" : "fake success"; }
int nvmlDeviceGetHandleByPciBusId_v2(const char *id, nvmlDevice_t *d) {
  if (strcmp(id, "00000000:3B:00.0")) return 6; /* NVML_ERROR_NOT_FOUND */
  *d = &device; return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) { if (i) return 2; *d = &device; return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 1; return 0; }
int nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned len) { strncpy(name, "Fake H100", len); return 0; }
int nvmlSystemGetDriverVersion(char *v, unsigned len) { strncpy(v, "999.1", len); return 0; }
int nvmlDeviceGetClockInfo(nvmlDevice_t d, unsigned type, unsigned *mhz) {
  if (d != &device || type != 1) return 2; *mhz = 1837; return 0;
}
int nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned *mw) { if (d != &device) return 2; *mw = 478250; return 0; }
C
cc -shared -fPIC -O1 -o "$work/libfake-nvml.so" "$work/fake_nvml.c"
mkdir -p "$work/lib" && cp "$work/libfake-nvml.so" "$work/lib/libnvidia-ml.so.1"

cd "$root"
FAKE_NVML="$work/libfake-nvml.so" cargo test --release -p flash-attn-tests --bin bench -- --nocapture 2>&1 \
  | grep -E "^test |test result|panicked|FAKE_NVML"
python3 -c "import sys; [compile(open(f).read(), f, \"exec\") for f in sys.argv[1:]]" scripts/bench_torch.py scripts/test_bench_torch.py
python3 scripts/test_bench_torch.py
# bench_torch.py's monitor through the real pynvml (nvidia-ml-py), where this python has it.
if python3 -c "import pynvml" 2>/dev/null; then
  LD_LIBRARY_PATH="$work/lib" python3 - <<'PY'
import sys, time
sys.path.insert(0, "scripts")
import bench_torch as bt
m = bt.Monitor("00000000:3B:00.0")
assert m.status == "NVML: Fake H100, driver 999.1", m.status
t = time.perf_counter(); time.sleep(0.05); m.sample_now()
r = m.mean((t, time.perf_counter())); m.close()
assert (r.mhz, r.watts) == (1837.0, 478.25) and r.samples >= 3, r
print("pynvml monitor: ok")
PY
else
  echo "pynvml not importable here: bench_torch.py's monitor tested with a stand-in only"
fi
bash -n scripts/gpu-check.sh scripts/fa4-stage.sh scripts/ncu-compare.sh
# peer_one.py imports bench_torch.py without torch and refuses bad arguments
# with its usage line (it runs on the GPU machine only).
if usage="$(python3 scripts/peer_one.py fa5 ours.jsonl causal 2>&1)"; then
  echo "peer_one.py took an unknown peer"; exit 1
fi
case "$usage" in "usage: python3 peer_one.py"*) ;; *) echo "peer_one.py: $usage"; exit 1 ;; esac
echo "test-bench-cpu: ok"

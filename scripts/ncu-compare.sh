#!/usr/bin/env bash
# ncu of one of our sm_90a forward launches beside one call of each peer on the
# same row, on a GPU machine with the gpu bundle (`cargo xtask gpu-bundle`;
# FA4 staged as gpu-check.sh says, for its column). Clocks are left to the GPU
# (`--clock-control none`), as docs/tuning.md's method says.
#   default: the metrics of $NCU_METRICS (time, instructions, L2 reads and
#     the L2 request coalescer's counters), printed per implementation;
#   --lines: warp-state sampling per SASS line (WarpStateStats,
#     SourceCounters), a report per implementation and its source page as CSV.
# usage: bash gpu-bundle/ncu-compare.sh HEAD_DIM SEQLEN causal|non-causal f16|bf16 [--lines] [--peers fa4,cudnn]
#   (results in $OUT/ncu or gpu-bundle/results/ncu)
set -u
here="$(cd "$(dirname "$0")" && pwd)"
[ $# -ge 4 ] || { sed -n 2,11p "$0"; exit 1; }
d="$1" s="$2" mask="$3" dtype="$4"
shift 4
lines=0
peers=fa4,cudnn
while [ $# -gt 0 ]; do
  case "$1" in
    --lines) lines=1 ;;
    --peers) peers="${2:-}"; shift ;;
    *) echo "ncu-compare: unknown argument $1"; exit 1 ;;
  esac
  shift
done
case "$mask" in causal) variant=causal; mask_args=() ;; non-causal) variant=full; mask_args=(--non-causal) ;;
  *) echo "ncu-compare: causal or non-causal, not '$mask'"; exit 1 ;; esac
results="${OUT:-$here/results}/ncu"
mkdir -p "$results"
if [ -f "$here/bin.tar.xz" ] && [ ! -x "$here/bin/bench" ]; then tar xJf "$here/bin.tar.xz" -C "$here" bin/bench || exit 1; fi
fa4_site="${FA4_SITE:-/tmp/fa4-site}"
[ -d "$fa4_site/flash_attn/cute" ] && export PYTHONPATH="$fa4_site/nvidia_cutlass_dsl/dsl_packages:$fa4_site${PYTHONPATH:+:$PYTHONPATH}"
if [ "$lines" = 1 ]; then
  what=(--section WarpStateStats --section SourceCounters)
else
  # The L2 request coalescer's counters, where this GPU's ncu has any (lrc__*).
  lrc="$(ncu --query-metrics 2>/dev/null | awk '/^lrc__/ { printf ",%s.sum", $1 }')"
  what=(--metrics "${NCU_METRICS:-gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,smsp__inst_executed.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_bytes.sum,l1tex__m_xbar2l1tex_read_bytes.sum,dram__bytes_read.sum$lrc}")
fi
row="d$d-$dtype-$mask-s$s"
profile() { # name, then the command to profile and its ncu selection
  local name="$1"; shift
  local report="$results/$row-$name"
  local status
  if [ "$lines" = 1 ]; then
    ncu --clock-control none "${what[@]}" -f -o "$report" "$@" > "$report.log" 2>&1
    status=$?
    ncu --import "$report.ncu-rep" --page source --csv --print-source sass > "$report-source.csv" 2>> "$report.log"
  else
    ncu --clock-control none "${what[@]}" "$@" > "$report.log" 2>&1
    status=$?
  fi
  echo "== $name ($row): ncu exit $status; $report.log"
  grep -E "^ +[a-z0-9_]+__[a-z0-9_.]+ +" "$report.log" | head -40
}
# Ours: the bench's first 30 launches of the kernel warm up, the 31st is
# profiled; its JSONL gives the peers the row's shape.
ours="$results/$row-ours.jsonl"
profile ours --kernel-name "regex:^flash_fwd_sm90_d${d}_${dtype}_${variant}" --launch-skip 30 --launch-count 1 \
  "$here/bin/bench" --no-decode --no-backward "${mask_args[@]}" --dtypes "$dtype" --head-dims "$d" --seqlens "$s" \
  --reps 5 --out "$ours"
for peer in ${peers//,/ }; do
  profile "$peer" --profile-from-start off python3 "$here/peer_one.py" "$peer" "$ours" "$mask"
done

#!/usr/bin/env bash
# Stages FlashAttention-4 (PyPI flash-attn-4 4.0.0b36 on nvidia-cutlass-dsl 4.8.1, the pins of
# /work/shared/anchors/fa4-wheels.sh; its sm90 kernels are the benchmark's FA4-sm90 column) for the
# GPU machine, which has torch but no network and takes at most 64 MiB of working tree per call
# (tracked files, about 17 MiB, included). Run it here, where PyPI is reachable:
#
#   bash scripts/fa4-stage.sh          (then `cargo xtask gpu-bundle` as usual)
#
# It downloads the wheels into .fa4/dl (git-ignored), unpacks the one large wheel
# (nvidia-cutlass-dsl-libs-cu13: 92 MB zipped, 237 MB of files) and packs its files again with xz
# (about 64 MB; some minutes on two cores), and cuts that into
#   .fa4/s1: the first 38 MiB of it ($FA4_PART1_MIB),
#   .fa4/s2: the rest, the seven small wheels (about 10 MB) and install.sh,
# so that each call below stays under 64 MiB. It prints the sizes and what each call carries. The
# whole gpu bundle (about 16 MiB) does not fit beside .fa4/s2: the second call carries a bench
# bundle instead (gpu-check.sh, bench_torch.py, peer_one.py, ncu-compare.sh and bin/bench alone,
# about 2 MiB), made here after `cargo xtask gpu-bundle`:
#   rm -rf .bench-bundle /tmp/bb && mkdir -p .bench-bundle /tmp/bb
#   cp gpu-bundle/*.sh gpu-bundle/*.py .bench-bundle/
#   tar xJf gpu-bundle/bin.tar.xz -C /tmp/bb bin/bench && tar cJf .bench-bundle/bin.tar.xz -C /tmp/bb bin
# and the tests part runs in a call of its own with the whole bundle.
#
# The two device calls, the second sent as soon as the first returns (a machine stays warm only some
# 30 s after a call, and /root/fa4-stage survives only while it is held; the first call's reply says
# `warm`, the second's must not say it started a fresh machine):
#   call 1: carry [".fa4/s1"]
#           command: mkdir -p /root/fa4-stage && cp .fa4/s1/* /root/fa4-stage/ && ls -l /root/fa4-stage
#   call 2: carry [".fa4/s2", ".bench-bundle"]
#           command: bash .fa4/s2/install.sh /root/fa4-stage /tmp/fa4-site; bash .bench-bundle/gpu-check.sh --part bench
# install.sh joins the parts, checks their sha256, installs the small wheels with pip --target
# /tmp/fa4-site, unpacks the large one's files there, checks them against the wheel's RECORD and
# imports `flash_attn.cute`; it says loudly what failed, and then gpu-check.sh runs without FA4
# (its table header says `FA4-sm90: not installed (...)`). gpu-check.sh finds /tmp/fa4-site (or
# $FA4_SITE) itself and sets PYTHONPATH; by hand:
#   export PYTHONPATH=/tmp/fa4-site/nvidia_cutlass_dsl/dsl_packages:/tmp/fa4-site
# (pip --target does not run the package's .pth file, hence the first entry.)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/.fa4"
part1_mib="${FA4_PART1_MIB:-38}"
pins=(flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
      nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1
      apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 quack-kernels==0.6.5)
stamp="${pins[*]} part1=${part1_mib}MiB v1"
git -C "$root" check-ignore -q .fa4/x || { echo "fa4-stage: .fa4/ is not git-ignored here; refusing" >&2; exit 1; }

if [ -f "$out/s2/install.sh" ] && [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "fa4-stage: $out already staged (rm -rf .fa4 to stage again)"
else
  rm -rf "$out"
  mkdir -p "$out/dl" "$out/s1" "$out/s2"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$out/dl" "${pins[@]}"
  big="$(ls "$out"/dl/nvidia_cutlass_dsl_libs_cu13-*.whl)"
  echo "fa4-stage: repacking $(basename "$big") with xz (some minutes)"
  mkdir -p "$out/dl/cu13"
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$big" "$out/dl/cu13"
  # Keep the executable bits the wheel's entries carry (zipfile drops them).
  python3 - "$big" "$out/dl/cu13" <<'PY'
import os, sys, zipfile
for info in zipfile.ZipFile(sys.argv[1]).infolist():
    mode = (info.external_attr >> 16) & 0o777
    if mode and not info.is_dir():
        os.chmod(os.path.join(sys.argv[2], info.filename), mode)
PY
  tar -C "$out/dl/cu13" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - . \
    | xz -9 -T0 > "$out/dl/cu13.tar.xz"
  sha="$(sha256sum "$out/dl/cu13.tar.xz" | cut -d' ' -f1)"
  head -c "$((part1_mib * 1024 * 1024))" "$out/dl/cu13.tar.xz" > "$out/s1/cu13.tar.xz.part1"
  tail -c "+$((part1_mib * 1024 * 1024 + 1))" "$out/dl/cu13.tar.xz" > "$out/s2/cu13.tar.xz.part2"
  for w in "$out"/dl/*.whl; do [ "$w" = "$big" ] || cp "$w" "$out/s2/"; done
  dist_info="$(basename "$big" | sed 's/^\(nvidia_cutlass_dsl_libs_cu13-[^-]*\)-.*/\1.dist-info/')"
  cat > "$out/s2/install.sh" <<INSTALL
#!/usr/bin/env bash
# usage: install.sh STAGE_DIR TARGET_DIR   (written by scripts/fa4-stage.sh: $stamp)
# STAGE_DIR holds cu13.tar.xz.part1 from the first call (.fa4/s1).
set -uo pipefail
here="\$(cd "\$(dirname "\$0")" && pwd)"
stage="\${1:-/root/fa4-stage}"; target="\${2:-/tmp/fa4-site}"
fail() { echo "fa4 install: FAILED: \$*; the benchmark runs without FA4"; rm -rf "\$target"; exit 1; }
[ -f "\$stage/cu13.tar.xz.part1" ] || fail "\$stage/cu13.tar.xz.part1 is missing (call 1 did not run on this machine, or it went cold in between)"
cat "\$stage/cu13.tar.xz.part1" "\$here/cu13.tar.xz.part2" > "\$stage/cu13.tar.xz" || fail "cannot join the parts"
echo "$sha  \$stage/cu13.tar.xz" | sha256sum -c - || fail "the joined parts' sha256 differs"
rm -rf "\$target" && mkdir -p "\$target" || fail "cannot make \$target"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "\$target" "\$here"/*.whl \\
  || fail "pip install of the small wheels"
python3 - "\$stage/cu13.tar.xz" "\$target" "$dist_info" <<'PY' || fail "unpacking nvidia-cutlass-dsl-libs-cu13"
import base64, csv, hashlib, os, sys, tarfile
archive, target, dist_info = sys.argv[1:4]
with tarfile.open(archive, "r:xz") as tar:
    try:
        tar.extractall(target, filter="data")
    except TypeError:  # a Python without extraction filters
        tar.extractall(target)
checked = 0
with open(os.path.join(target, dist_info, "RECORD"), newline="") as f:
    for path, digest, _ in csv.reader(f):
        if not digest:
            continue
        algorithm, expected = digest.split("=", 1)
        with open(os.path.join(target, path), "rb") as g:
            actual = base64.urlsafe_b64encode(hashlib.new(algorithm, g.read()).digest()).rstrip(b"=").decode()
        if actual != expected:
            sys.exit(f"{path}: {algorithm} differs from the wheel's RECORD")
        checked += 1
print(f"nvidia-cutlass-dsl-libs-cu13: {checked} files match the wheel's RECORD")
PY
rm -f "\$stage/cu13.tar.xz"
PYTHONPATH="\$target/nvidia_cutlass_dsl/dsl_packages:\$target" python3 -c \\
  'from flash_attn.cute import flash_attn_func; import importlib.metadata as m; print("fa4 install: flash-attn-4", m.version("flash-attn-4"), "imports")' \\
  || fail "from flash_attn.cute import flash_attn_func"
echo "fa4 install: done; gpu-check.sh uses \$target (by hand: export PYTHONPATH=\$target/nvidia_cutlass_dsl/dsl_packages:\$target)"
INSTALL
  chmod +x "$out/s2/install.sh"
  rm -rf "$out/dl"
  echo "$stamp" > "$out/stamp"
fi

# What each call carries: the working tree that travels (tracked files and untracked ones git does
# not ignore) plus the carried folders.
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
bytes() { du -sb "$@" 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'; }
tree_bytes="$(cd "$root" && { git ls-files -z; git ls-files -z -o --exclude-standard; } \
  | xargs -0 -r du -b --apparent-size 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')"
s1="$(bytes "$out/s1")"; s2="$(bytes "$out/s2")"
du -sh "$out/s1" "$out/s2"
if [ -d "$root/.bench-bundle" ]; then bundle="$(bytes "$root/.bench-bundle")"; bundle_note=""; else
  bundle=$((3 * 1048576)); bundle_note=" (.bench-bundle not made yet: 3 MiB assumed)"; fi
call1=$((tree_bytes + s1)); call2=$((tree_bytes + s2 + bundle))
echo "fa4-stage: working tree $(mib "$tree_bytes"); call 1 carries .fa4/s1: $(mib "$call1") in all; call 2 carries .fa4/s2 and .bench-bundle: $(mib "$call2") in all$bundle_note (limit 64 MiB a call)"
limit=$((64 * 1048576))
if [ "$call1" -gt "$limit" ] || [ "$call2" -gt "$limit" ]; then
  echo "fa4-stage: WARNING: a call is over 64 MiB; set FA4_PART1_MIB (now $part1_mib) to move bytes between the calls and run again after rm -rf .fa4" >&2
fi

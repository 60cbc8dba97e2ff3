#!/usr/bin/env bash
# candle-transformers (its current 0.11 release, feature `flash-attn`) built
# against this repository's `candle-flash-attn` by one `[patch.crates-io]`
# line (issue 65), in a program of its own outside the workspace
# (scripts/candle-transformers: Cargo.toml.in, and src/main.rs, which runs
# its Llama with use_flash_attn on and off on the GPU; the candle GPU bundle
# carries it). Checks that the patch took (no candle-flash-attn from
# crates.io in the graph) and that cudarc's bindings follow candle-core's own
# choice (`cuda-version-from-build-system`: nvcc's version), which flash-attn
# must not override. Prints the path of the binary on its last line.
#
# Needs what the candle crate needs (`. scripts/candle-setup.sh`). One release
# build in the workspace's target folder, so that what the workspace's
# release build already compiled (candle-core, its kernels, cudarc) is
# reused when the features match.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Outside the workspace, so `cargo fmt --all` does not see it.
rustfmt --edition 2021 --config-path "$root/rustfmt.toml" --check "$root/scripts/candle-transformers/src/main.rs"
work="$root/target/candle-transformers-check"
mkdir -p "$work"
rm -rf "$work/src"
cp -r "$root/scripts/candle-transformers/src" "$work/src"
sed "s|@ROOT@|$root|" "$root/scripts/candle-transformers/Cargo.toml.in" > "$work/Cargo.toml"
# The workspace's lock file pins what the workspace tested; cargo adds
# candle-transformers and what it needs.
cp "$root/Cargo.lock" "$work/Cargo.lock"
start=$SECONDS
log="$(mktemp)"
trap 'rm -f "$log" "$log.json"' EXIT
if ! (cd "$work" && CARGO_TARGET_DIR="$root/target" nice -n 10 cargo build --release \
  --message-format=json-render-diagnostics > "$log.json" 2> "$log"); then
  cat "$log" >&2
  echo "test-candle-transformers: the build failed" >&2
  exit 1
fi
took=$((SECONDS - start))
if grep -q "was not used in the crate graph" "$log"; then
  cat "$log" >&2
  echo "test-candle-transformers: cargo did not use the [patch] of candle-flash-attn" >&2
  exit 1
fi
read -r patched transformers < <(python3 - "$work/Cargo.lock" <<'PY'
import sys, tomllib
packages = tomllib.load(open(sys.argv[1], "rb"))["package"]
ours = [p for p in packages if p["name"] == "candle-flash-attn"]
if len(ours) != 1 or "source" in ours[0]:
    sys.exit("test-candle-transformers: candle-flash-attn in the graph: %r (expected ours alone, from a path)" % ours)
ct = [p["version"] for p in packages if p["name"] == "candle-transformers"]
print(ours[0]["version"], ct[0])
PY
)
nvcc_version="$(nvcc --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/cuda-\10\20/p')"
bindings="$(python3 -c '
import json, re, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "build-script-executed" and re.search(r"(^|#)cudarc[@ ]", m.get("package_id", "")):
        env = dict(m.get("env", []))
        if "CUDA_MAJOR_VERSION" in env:
            print("cuda-%s0%s0" % (env["CUDA_MAJOR_VERSION"], env["CUDA_MINOR_VERSION"]))
' "$log.json" | sort -u)"
rm -f "$log.json"
if [ "$bindings" != "$nvcc_version" ]; then
  echo "test-candle-transformers: cudarc's bindings are '$bindings', not nvcc's $nvcc_version (candle-core's choice)" >&2
  exit 1
fi
exe="$root/target/release/candle-transformers-check"
echo "test-candle-transformers: candle-transformers $transformers (flash-attn) on candle-flash-attn $patched from this checkout, cudarc bindings $bindings (nvcc's), release build in ${took} s"
echo "$exe"

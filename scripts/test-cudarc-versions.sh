#!/usr/bin/env bash
# The CUDA version of cudarc's bindings is the program's (issue 65): flash-attn
# selects none, so a program may pin any.
#
# 1. The consumer program of scripts/test-consumer.sh (scripts/consumer/src),
#    built as there (outside the workspace, stable Rust, no CUDA variables,
#    no nvcc, no libcuda) by a program that pins cudarc's `cuda-13000`, and by
#    one that pins `cuda-12080`: each must build, with the bindings of the
#    version it pinned (what cudarc's build script reports), and not link
#    libcuda. (With flash-attn selecting a version itself, a program pinning
#    another did not compile: both versions' bindings, E0428/E0119.)
# 2. flash-attn's cudarc door compiled (`cargo check`) against the bindings
#    of every CUDA version that the locked cudarc knows (its `cuda-XXXXX`
#    features), chosen through CUDARC_CUDA_VERSION (cudarc's build script
#    takes it before features and nvcc): the crate must use only cudarc
#    items that all of them have. About 4 s a version once the dependencies
#    are checked.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if ! rustup run stable rustc --version >/dev/null 2>&1; then
  rustup toolchain install stable --profile minimal >&2
fi
clean_env=(env -i "HOME=$HOME" "PATH=/usr/local/bin:/usr/bin:/bin:${CARGO_HOME:-$HOME/.cargo}/bin"
  "CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}" "RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}" "CARGO_TARGET_DIR=$work/target")
if "${clean_env[@]}" sh -c 'command -v nvcc' >/dev/null; then
  echo "test-cudarc-versions: nvcc is on the clean PATH; the pinned builds must show they need none" >&2
  exit 1
fi
cp -r "$root/scripts/consumer/src" "$work/src"
# The workspace's lock file pins the versions the tests ran with.
cp "$root/Cargo.lock" "$work/Cargo.lock"
for pin in cuda-13000 cuda-12080; do
  cat > "$work/Cargo.toml" <<EOF
[package]
name = "flash-attn-consumer"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
flash-attn = { path = "$root/host", default-features = false, features = ["cudarc"] }
# The program's own choice of CUDA version.
cudarc = { version = "0.19", default-features = false, features = ["$pin"] }
EOF
  start=$SECONDS
  json="$(cd "$work" && "${clean_env[@]}" cargo +stable build --quiet --message-format=json-render-diagnostics)"
  # The version cudarc's build script chose (its CUDA_MAJOR/MINOR_VERSION).
  version="$(printf '%s\n' "$json" | python3 -c '
import json, re, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "build-script-executed" and re.search(r"(^|#)cudarc[@ ]", m.get("package_id", "")):
        env = dict(m.get("env", []))
        if "CUDA_MAJOR_VERSION" in env:
            print("cuda-%s0%s0" % (env["CUDA_MAJOR_VERSION"], env["CUDA_MINOR_VERSION"]))
')"
  if [ "$version" != "$pin" ]; then
    echo "test-cudarc-versions: the program pinned $pin but cudarc's bindings are '${version:-not reported}'" >&2
    exit 1
  fi
  if ldd "$work/target/debug/flash-attn-consumer" | grep -q libcuda; then
    echo "test-cudarc-versions: the $pin build links libcuda; it must open it at run time" >&2
    exit 1
  fi
  echo "test-cudarc-versions: a program pinning cudarc's $pin builds with cargo alone, on $version bindings ($((SECONDS - start)) s)"
done

manifest="$(cargo metadata --format-version 1 --locked 2>/dev/null | python3 -c '
import json, sys
packages = [p for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc"]
if len(packages) != 1:
    sys.exit("test-cudarc-versions: expected one cudarc in Cargo.lock, found %d" % len(packages))
print(packages[0]["manifest_path"])
')"
versions="$(sed -n 's/^cuda-\([0-9]\{5\}\) = \[\]$/\1/p' "$manifest" | sort)"
[ -n "$versions" ] || { echo "test-cudarc-versions: no cuda-XXXXX features in $manifest" >&2; exit 1; }
start=$SECONDS
checked=()
for v in $versions; do
  if ! CUDARC_CUDA_VERSION="$v" CARGO_TARGET_DIR="$root/target/cudarc-versions" \
    cargo check --quiet --locked -p flash-attn --no-default-features --features cudarc --lib; then
    echo "test-cudarc-versions: flash-attn does not compile against cudarc's CUDA $v bindings" >&2
    exit 1
  fi
  checked+=("$v")
done
echo "test-cudarc-versions: flash-attn's cudarc door compiles against the bindings of CUDA ${checked[*]} ($(basename "$(dirname "$manifest")"): ${#checked[@]} versions, $((SECONDS - start)) s)"

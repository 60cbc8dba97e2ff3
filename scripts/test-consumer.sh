#!/usr/bin/env bash
# A user's program on the cudarc door, the way issue 30 promises it works:
# copied outside the workspace, built on stable Rust in an environment with
# no CUDA variables and no libcuda (not even the link-time copy setup.sh
# fetches), then run. It must build, not link libcuda, start, and report
# the missing driver (or, on a GPU machine, run one call).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r "$root/scripts/consumer/src" "$work/src"
sed "s|@HOST@|$root/host|" "$root/scripts/consumer/Cargo.toml.in" > "$work/Cargo.toml"
# The workspace's lock file pins the versions the tests ran with.
cp "$root/Cargo.lock" "$work/Cargo.lock"
if ! rustup run stable rustc --version >/dev/null 2>&1; then
  rustup toolchain install stable --profile minimal >&2
fi
clean_env=(env -i "HOME=$HOME" "PATH=/usr/local/bin:/usr/bin:/bin:${CARGO_HOME:-$HOME/.cargo}/bin"
  "CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}" "RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}" "CARGO_TARGET_DIR=$work/target")
(cd "$work" && "${clean_env[@]}" cargo +stable build --quiet)
exe="$work/target/debug/flash-attn-consumer"
if ldd "$exe" | grep -q libcuda; then
  echo "consumer: the binary links libcuda; it must open it at run time" >&2
  exit 1
fi
out="$(cd "$work" && "${clean_env[@]}" "$exe")"
echo "consumer: $out"
case "$out" in
  "no driver: "*|"driver, no usable GPU: "*|"ran on "*) ;;
  *) echo "consumer: unexpected output" >&2; exit 1 ;;
esac

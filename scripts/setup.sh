#!/usr/bin/env bash
# Installs what building and testing this workspace needs, idempotently, into
# folders of the checkout (nothing system-wide but the pinned Rust toolchain):
#   - the nightly toolchain pinned in rust-toolchain.toml, with its components;
#   - ptxas (PyPI wheel nvidia-cuda-nvcc-cu12) in .tools/venv, for the PTX
#     resource checks;
#   - libcuda.so (Debian non-free package libcuda1) in .tools/cuda/lib64, only to
#     link `cust` on a machine without an NVIDIA driver. At run time the
#     driver's own libcuda.so.1 is used.
# Source it (`. scripts/setup.sh`) to get PTXAS (and, without a driver,
# LD_LIBRARY_PATH for the link-time libcuda) exported.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/.tools"
mkdir -p "$tools"

toolchain="$(sed -n 's/^channel *= *"\(.*\)"/\1/p' "$root/rust-toolchain.toml")"
if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1 \
   || ! rustup component list --toolchain "$toolchain" --installed 2>/dev/null | grep -q '^rust-src'; then
  echo "setup: installing Rust toolchain $toolchain" >&2
  rustup toolchain install "$toolchain" --profile minimal \
    -c rust-src -c llvm-tools -c llvm-bitcode-linker -c rustfmt -c clippy >&2
fi

ptxas_wheel="nvidia-cuda-nvcc-cu12==12.9.86"
if [ ! -x "$tools/venv/bin/python" ]; then
  echo "setup: creating $tools/venv" >&2
  python3 -m venv "$tools/venv" >&2
fi
ptxas="$(find "$tools/venv" -path '*cuda_nvcc/bin/ptxas' -type f 2>/dev/null | head -n1)"
if [ -z "$ptxas" ]; then
  echo "setup: installing $ptxas_wheel (ptxas)" >&2
  "$tools/venv/bin/pip" install -q --disable-pip-version-check "$ptxas_wheel" >&2
  ptxas="$(find "$tools/venv" -path '*cuda_nvcc/bin/ptxas' -type f | head -n1)"
fi
export PTXAS="$ptxas"

# cust's build script links -lcuda from $CUDA_LIBRARY_PATH/lib64 (or a CUDA
# installation under /usr/local/cuda); .cargo/config.toml points it here.
libdir="$tools/cuda/lib64"
if [ -e /usr/local/cuda/lib64/stubs/libcuda.so ] || [ -e /usr/local/cuda/lib64/libcuda.so ]; then
  :
elif [ ! -e "$libdir/libcuda.so" ]; then
  echo "setup: fetching Debian's libcuda1 (link-time only) into $libdir" >&2
  apt_dir="$tools/apt"
  mkdir -p "$apt_dir/sources" "$apt_dir/lists/partial" "$apt_dir/debs" "$libdir"
  for f in /etc/apt/sources.list.d/*.sources; do
    sed 's/^Components:.*/Components: main contrib non-free/' "$f" > "$apt_dir/sources/$(basename "$f")"
  done
  apt_opts=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$apt_dir/sources"
            -o "Dir::State::Lists=$apt_dir/lists" -o Debug::NoLocking=1)
  apt-get "${apt_opts[@]}" update -qq >&2
  (cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" download -qq libcuda1 >&2)
  dpkg-deb -x "$apt_dir"/debs/libcuda1_*.deb "$apt_dir/root"
  so="$(find "$apt_dir/root" -name 'libcuda.so.1' | head -n1)"
  cp -L "$so" "$libdir/libcuda.so.1"
  ln -sf libcuda.so.1 "$libdir/libcuda.so"
fi
# Executables linked against libcuda load libcuda.so.1 at start; without a
# driver, the link-time copy serves (cuInit then reports no device).
if [ -e "$libdir/libcuda.so.1" ]; then
  export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
echo "setup: toolchain $toolchain, PTXAS=$PTXAS, libcuda for linking: $(ls "$libdir"/libcuda.so /usr/local/cuda/lib64/stubs/libcuda.so 2>/dev/null | head -n1)" >&2

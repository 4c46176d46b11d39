#!/usr/bin/env bash
# The CUDA 13.0 build toolkit for candle's `cuda` feature, without touching
# the system: nvcc from PyPI's pinned wheel set under target/cuda-toolkit/,
# and link-time stubs of the CUDA libraries candle links (cudarc
# "dynamic-linking") with the H200 host's real SONAMEs and symbol versions,
# so the binary binds to the real libraries there. Idempotent.
#
#   eval "$(tools/cuda-toolkit.sh)"     # installs if needed, exports the env
#   cargo build -p wavefuse-candle --features cuda
#
# Exports: PATH (nvcc first), CUDA_COMPUTE_CAP=90 (candle-kernels' target),
# CUDARC_CUDA_VERSION=13000 (stands in for `nvcc --version` in cudarc's
# cuda-version-from-build-system), CUDA_ROOT (candle-kernels finds the headers), and
# WAVEFUSE_CUDA_STUBS (candle/build.rs adds it as a native link-search path;
# RUSTFLAGS would rebuild every crate, candle-kernels' nvcc step included).
# Logs go to stderr, the export lines to stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="${WAVEFUSE_CUDA_TOOLKIT_DIR:-$root/target/cuda-toolkit}"
py="${PYTHON:-python3}"

# The whole set pinned to 13.0, the H200 driver's CUDA version: left
# unpinned, pip takes nvvm/crt 13.5, whose PTX (.version 9.5) the 13.0 ptxas
# rejects.
pins=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
      "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*")
stamp="$dir/.pins"
want="${pins[*]}"

if [ ! -x "$dir/wheels/nvidia/cu13/bin/nvcc" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "cuda-toolkit: installing ${pins[*]} into $dir/wheels" >&2
  rm -rf "$dir/wheels" && mkdir -p "$dir"
  "$py" -m pip install --quiet --disable-pip-version-check --no-deps --no-warn-script-location \
    --target "$dir/wheels" "${pins[@]}" >&2
  printf '%s' "$want" > "$stamp"
fi
cu="$dir/wheels/nvidia/cu13"
[ -x "$cu/bin/nvcc" ] || { echo "cuda-toolkit: no nvcc at $cu/bin/nvcc" >&2; exit 1; }

# Stubs: rebuilt when a symbol list is newer than its stub.
stubs="$dir/stubs"
syms="$root/tools/cuda13-symbols"
mkdir -p "$stubs"
for f in "$syms"/*.syms; do
  so=$(basename "$f" .syms); base=${so%%.so*}
  [ "$stubs/$base.so" -nt "$f" ] && continue
  grep -v '^lib' "$f" | sed 's/@@.*//' | grep -E '^[A-Za-z_][A-Za-z0-9_]*$' | sort -u \
    | awk '{print "void " $1 "(void){}"}' > "$stubs/$base.c"
  vs=()
  if grep -q '@@' "$f"; then
    printf '%s { global: *; };\n' "$so" > "$stubs/$base.map"
    vs=(-Wl,--version-script="$stubs/$base.map")
  fi
  ${CC:-cc} -shared -fPIC -o "$stubs/$base.so" "$stubs/$base.c" -Wl,-soname,"$so" "${vs[@]}"
  # Under its SONAME too: a CUDA binary then starts here (CPU device only)
  # with LD_LIBRARY_PATH=$stubs, for smoke tests off the GPU.
  ln -sf "$base.so" "$stubs/$so"
done

echo "cuda-toolkit: $("$cu/bin/nvcc" --version | tail -2 | head -1)" >&2
cat <<ENV
export PATH="$cu/bin:\$PATH"
export CUDA_ROOT="$cu"
export CUDA_COMPUTE_CAP=90
export CUDARC_CUDA_VERSION=13000
export WAVEFUSE_CUDA_STUBS="$stubs"
ENV

#!/usr/bin/env bash
# Installs what is missing, then configures and builds dsv41kv into build/ (the CLI lands at
# build/dsv41kv). Extra arguments go to cmake. The CUDA backend is built when nvcc is found
# (on PATH or in /usr/local/cuda/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
builddir=${DSV41KV_BUILD_DIR:-build}
jobs=${DSV41KV_JOBS:-$(nproc)}
cmake -S . -B "$builddir" -G Ninja -DCMAKE_BUILD_TYPE=${DSV41KV_BUILD_TYPE:-Release} "$@" >/dev/null
cmake --build "$builddir" -j "$jobs"

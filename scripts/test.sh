#!/usr/bin/env bash
# Builds and runs every test: the release build (CPU tests; CUDA tests skip without a GPU), the
# CMake package (installed from that build, a consumer project built and run against it), the
# whole CPU suite again against the library built with AddressSanitizer + UndefinedBehaviorSanitizer
# (CMakeLists.txt: DSV41KV_SANITIZE), then the Python package (pip install into a virtual
# environment, CPU-only, and pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
(cd build && ctest --output-on-failure -j "$(nproc)")
rm -rf build/install build/consumer
cmake --install build --prefix build/install >/dev/null
cmake -S examples/cmake-consumer -B build/consumer -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/consumer >/dev/null && build/consumer/consumer
DSV41KV_BUILD_DIR=build-asan DSV41KV_BUILD_TYPE=Debug scripts/build.sh \
  -DDSV41KV_CUDA=OFF -DDSV41KV_BENCH=OFF -DDSV41KV_SANITIZE=address,undefined
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure -j "$(nproc)")
scripts/test-python.sh
